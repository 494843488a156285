"""The target checkpoint's chat template (`chat_template` of its tokenizer_config.json, a Jinja
template), rendered in a sandbox with the variables such templates read: `messages`,
`add_generation_prompt` (true: the prompt ends where the assistant's reply begins), `bos_token`,
`eos_token` and `raise_exception`."""
from __future__ import annotations

import json

from conjugate.roles import Model
from conjugate.serving.decoder import GenerationError


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", where: str = "chat template"):
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            raise GenerationError(f"{where}: not a valid Jinja template: {e}") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def of(cls, workload) -> "ChatTemplate | None":
        """The target checkpoint's template, or None where it has none."""
        directory = workload.checkpoint_dir(Model.TARGET)
        path = directory / "tokenizer_config.json" if directory else None
        if path is None or not path.is_file():
            return None
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise GenerationError(f"{path}: not readable JSON ({type(e).__name__})") from None
        source = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(source, list):  # named templates: the default one
            source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"),
                          None)
        if source is None:
            return None
        if not isinstance(source, str):
            raise GenerationError(f"{path}: field 'chat_template' must be a string")
        return cls(source, _token(config.get("bos_token")), _token(config.get("eos_token")), f"{path} chat_template")

    def render(self, messages: list[dict]) -> str:
        """The prompt text of a conversation; ValueError says why a conversation does not render."""
        from jinja2 import TemplateError

        try:
            return self._template.render(messages=messages, add_generation_prompt=True, bos_token=self.bos_token,
                                         eos_token=self.eos_token)
        except (TemplateError, _TemplateRefused) as e:
            raise ValueError(str(e)) from None


class _TemplateRefused(Exception):
    pass


def _raise(message: str):
    raise _TemplateRefused(message)


def _token(value) -> str:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""
