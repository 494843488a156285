"""`conjugate models`: the model presets as a table."""
from __future__ import annotations

import argparse

from rich.table import Table

from conjugate.cli.console import out


def cmd_models(args: argparse.Namespace) -> None:
    from conjugate.models import PRESETS

    table = Table(title="Model presets")
    for col in ("name", "family", "params", "hidden", "layers", "heads/kv", "head dim", "ffn", "vocab", "features"):
        table.add_column(col, justify="left" if col in ("name", "family", "features") else "right")
    for spec in PRESETS.values():
        features = [f for f, on in (("qkv-bias", spec.qkv_bias), ("qk-norm", spec.qk_norm),
                                    ("llama3-rope", spec.rope_scaling), ("tied", spec.tied_embeddings)) if on]
        table.add_row(spec.name, spec.family, f"{spec.num_params() / 1e9:.2f}B" if spec.num_params() > 1e8
                      else f"{spec.num_params() / 1e6:.2f}M", str(spec.hidden_size), str(spec.num_layers),
                      f"{spec.num_heads}/{spec.num_kv_heads}", str(spec.head_dim), str(spec.ffn_size),
                      str(spec.vocab_size), " ".join(features))
    out.print(table)


def add_command(sub) -> None:
    sub.add_parser("models", help="list the model presets").set_defaults(func=cmd_models)
