"""The ``fairlane`` command: argparse subcommands (serve, worker, generate, admin), each in its own module.

Subcommand modules are imported when their command runs: ``fairlane generate`` loads the engine
(torch), ``fairlane serve`` does not (gateway/cli/torch_free.py).
"""

from __future__ import annotations

import argparse

from gateway.cli.process_exit import prepare_exit


def _serve(args: argparse.Namespace) -> int:
    from gateway.cli import serve

    code = serve.main(args)
    prepare_exit()  # the process ends when the command returns
    return code


def _worker(args: argparse.Namespace) -> int:
    from gateway.worker import main as worker_main

    worker_main.main({"policy": args.policy} if args.policy else None)
    prepare_exit()  # the process ends when the command returns
    return 0


def _admin(args: argparse.Namespace) -> int:
    from gateway.cli import admin

    return admin.main(args)


def _generate(args: argparse.Namespace) -> int:
    from gateway.cli import generate

    code = generate.main(args)
    prepare_exit()  # the process ends when the command returns
    return code


def add_policy_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        help="the workers' scheduling policy (engine.policy): fcfs (default), "
        "priority, vtc, priority+vtc; add '+slo' for SLO-aware admission (targets: "
        "tier_ttft_targets...)",
    )


def build_parser() -> argparse.ArgumentParser:
    from gateway.cli import admin, generate, serve

    parser = argparse.ArgumentParser(prog="fairlane", description="Multi-tenant LLM gateway and engine.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve_parser = commands.add_parser("serve", help="run Redis, the database, workers and the gateway")
    serve.add_arguments(serve_parser)
    add_policy_argument(serve_parser)
    serve_parser.set_defaults(func=_serve)

    worker_parser = commands.add_parser("worker", help="run one engine worker (settings from FAIRLANE_*)")
    add_policy_argument(worker_parser)
    worker_parser.set_defaults(func=_worker)

    generate_parser = commands.add_parser("generate", help="offline batch generation from a JSONL file")
    generate.add_arguments(generate_parser)
    generate_parser.set_defaults(func=_generate)

    admin_parser = commands.add_parser(
        "admin", help="tenants, keys, quotas and usage (a gateway or the database)"
    )
    admin.add_arguments(admin_parser)
    admin_parser.set_defaults(func=_admin)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0
