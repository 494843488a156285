"""`conjugate serve`: an OpenAI-compatible HTTP server over a plan's compiled round (serving/http.py)."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.text import Text

from conjugate.cli.arguments import integer
from conjugate.cli.console import out
from conjugate.cli.decoding import add_decoding_arguments, chosen_plan, workload_fields
from conjugate.serving.decoder import GenerationError

DEFAULT_BATCH, DEFAULT_CONTEXT = 8, 2048  # a pair given by flags: sequences per group, KV capacity


def add_command(sub) -> None:
    serve = sub.add_parser("serve", help="an OpenAI-compatible server (/v1/completions, /v1/chat/completions) "
                                         "over a plan's compiled round")
    add_decoding_arguments(serve, sized=f"the workload's, else {DEFAULT_BATCH} and {DEFAULT_CONTEXT}")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=integer(0, 65535), default=8000,
                       help="port (default: 8000; 0: a free one, printed)")
    serve.add_argument("--model-name", help="the model's name in the API (default: the workload's name)")
    serve.add_argument("--max-tokens", type=integer(1, 1 << 20), default=16,
                       help="a request's max_tokens when it gives none (default: 16, as the OpenAI API)")
    serve.set_defaults(func=lambda args: cmd_serve(args, out))


def cmd_serve(args: argparse.Namespace, out: Console) -> None:
    from conjugate.serving.chat import ChatTemplate
    from conjugate.serving.completions import Completions
    from conjugate.serving.http import create_app
    from conjugate.serving.server import Server, listen
    from conjugate.workload import workload_from_dict

    plan, variants = chosen_plan(args)  # a bad plan or variant is refused before any model loads
    fields, where = workload_fields(args)
    workload = workload_from_dict({"draft_batch": DEFAULT_BATCH, "target_batch": DEFAULT_BATCH,
                                   "context": DEFAULT_CONTEXT} | fields, where)
    workload.require_real_weights(where)  # before any model loads
    chat = ChatTemplate.of(workload)
    with listen(args.host, args.port) as listener:  # a taken port is refused before any model loads
        name = plan if isinstance(plan, str) else plan.name
        with out.status(Text(f"compiling {name!r} for {workload.name} ({args.mode})")):
            service = Completions.build(workload, plan, args.mode, model=args.model_name, variants=variants)
        app = create_app(service, chat, default_max_tokens=args.max_tokens)
        server = Server(app, on_stop=service.engine.close)  # a signal ends every unfinished request at once
        with service:  # the engine's thread runs while the server does
            host, port = listener.getsockname()[:2]
            host = f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it
            out.print(f"serving {service.model!r} ({name}, {args.mode}, {service.engine.decoder.capacity} sequences "
                      f"at once, context {workload.context}) on http://{host}:{port}/v1", markup=False)
            server.run(sockets=[listener])
            server.stopped()
    out.print("stopped", markup=False)
