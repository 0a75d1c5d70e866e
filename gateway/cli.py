"""The ``fairlane`` command: argparse subcommands, each implemented in its own module."""

from __future__ import annotations

import argparse
import sys


def _serve(args: argparse.Namespace) -> int:
    from gateway import serve

    return serve.main(args)


def _worker(args: argparse.Namespace) -> int:
    from gateway import worker_main

    worker_main.main({"policy": args.policy} if args.policy else None)
    return 0


def _generate(args: argparse.Namespace) -> int:
    from gateway import generate_cmd

    return generate_cmd.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairlane", description="Multi-tenant LLM gateway and engine.")
    commands = parser.add_subparsers(dest="command", required=True)

    from gateway import serve

    serve_parser = commands.add_parser("serve", help="run Redis, the database, workers and the gateway")
    serve.add_arguments(serve_parser)
    serve_parser.set_defaults(func=_serve)

    worker_parser = commands.add_parser("worker", help="run one engine worker (settings from FAIRLANE_*)")
    serve.add_policy_argument(worker_parser)
    worker_parser.set_defaults(func=_worker)

    generate_parser = commands.add_parser("generate", help="offline batch generation from a JSONL file")
    try:
        from gateway import generate_cmd
    except ImportError:
        generate_cmd = None
    if generate_cmd is not None and hasattr(generate_cmd, "add_arguments"):
        generate_cmd.add_arguments(generate_parser)
    generate_parser.set_defaults(func=_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
