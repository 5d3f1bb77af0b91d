"""The `magic` command.

    magic serve {controller,rollout,reward,learner}   run one service (settings from MAGIC_* env)
    magic demo prepare [--out DIR]                    build the tiny model + data (cached)
    magic local [options]                             the whole loop on this machine

Heavy libraries are imported only by the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import sys

SERVICES = ("controller", "rollout", "reward", "learner")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="magic", description="MAGIC: multi-stage GRPO with adaptive entropy control")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one service")
    serve.add_argument("service", choices=SERVICES)

    demo = sub.add_parser("demo", help="the tiny demo model and task")
    demo_sub = demo.add_subparsers(dest="demo_command", required=True)
    prep = demo_sub.add_parser("prepare", help="build the tokenizer, model, data and supervised warm start (cached)")
    prep.add_argument("--out", default=".magic/demo", help="output directory (default: .magic/demo)")
    prep.add_argument("--force", action="store_true", help="rebuild even if a cached copy exists")

    local = sub.add_parser("local", help="run the whole loop on this machine (private Redis, all services, tiny model)")
    from magic.local.options import add_arguments

    add_arguments(local)

    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve_service(args.service)
    if args.command == "demo":
        import logging

        from magic.demo.prepare import prepare

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
        prepare(args.out, force=args.force)
        return 0
    if args.command == "local":
        from magic.local.launcher import launch

        return launch(args)
    return 2


def serve_service(name: str) -> int:
    if name == "controller":
        from magic.controller.app import run
    elif name == "rollout":
        from magic.rollout.worker import run
    elif name == "reward":
        from magic.reward.worker import run
    else:
        from magic.learner.worker import run
    return run()


if __name__ == "__main__":
    sys.exit(main())
