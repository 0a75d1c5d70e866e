"""One more gateway process of ``fairlane serve --gateway-workers N``: serves the listening socket
that serve bound and passed down (file descriptor ``--fd``) with the settings serve resolved
(JSON in ``FL_SERVE_SETTINGS_JSON``). It shares nothing with the other gateway processes but Redis
and the database; the kernel spreads the socket's connections over them.

    python -m gateway.cli.gateway_process --fd 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fd", type=int, required=True, help="the listening socket's file descriptor")
    args = parser.parse_args()
    from gateway.cli.serve import SETTINGS_ENV, uvicorn_config
    from gateway.cli.torch_free import tokenizer_without_torch, torch_free
    from gateway.settings import ServeSettings, load_settings
    from gateway.telemetry.logs import setup_logging

    settings = load_settings(ServeSettings, "fairlane gateway", **json.loads(os.environ.pop(SETTINGS_ENV)))
    if tokenizer_without_torch(settings.engine.model):
        torch_free()
    setup_logging(settings, "gateway")
    sock = socket.socket(fileno=args.fd)
    import uvicorn

    from gateway.api.app import create_app

    uvicorn.Server(uvicorn_config(create_app(settings), settings)).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    from gateway.cli.process_exit import prepare_exit

    code = main()
    prepare_exit()
    raise SystemExit(code)
