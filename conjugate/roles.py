"""The two models of a round. An op id starts with the model's short form (`d.s2.l5.gate_up`,
`t.l17.attn`); everything else names a model by its full name (`draft`, `target`)."""
from __future__ import annotations

from enum import StrEnum


class Model(StrEnum):
    DRAFT = "draft"
    TARGET = "target"

    @property
    def short(self) -> str:
        """The op-id prefix: "d" or "t"."""
        return self.value[0]

    @classmethod
    def from_short(cls, short: str) -> "Model":
        for model in cls:
            if model.short == short:
                return model
        raise ValueError(f"no model with short form {short!r} (expected d or t)")

    @classmethod
    def of_op(cls, op_id: str) -> "Model":
        """The model an op id belongs to: `t.l3.qkv` -> TARGET."""
        return cls.from_short(op_id.split(".", 1)[0])
