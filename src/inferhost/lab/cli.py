"""The local lab: a fake Proxmox API and podman guests that the whole stack converges against.

    inferhost-lab up        build what is missing, start the lab, converge site.yml, move the GPUs to the
                            VM and back with gpu-switch, validate the inference service, print a summary
                            (--hosts 2: a cluster of two hosts, the inventory's second host uncommented)
    inferhost-lab converge  converge site.yml again (add --check for a dry run)
    inferhost-lab deploy    the README's deployment order against the running lab, each playbook on its own
    inferhost-lab ssh HOST  a shell (or a command) on a lab machine, as the inventory reaches it
    inferhost-lab status    what runs
    inferhost-lab down      remove the containers and stop the fake API

This module is the command line only: it parses the arguments, hands each command to its body in journey.py
and prints a LabError as one line on stderr, with exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import journey
from .context import ROOT, LabError


def cmd_up(args: argparse.Namespace) -> int:
    journey.up(check=args.check, host_count=args.hosts)
    return 0


def cmd_converge(args: argparse.Namespace) -> int:
    journey.converge_again(check=args.check)
    return 0


def cmd_deploy(_: argparse.Namespace) -> int:
    journey.deploy()
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    return journey.shell(args.host, args.argv)


def cmd_status(_: argparse.Namespace) -> int:
    journey.status()
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    journey.down()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferhost-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the lab and converge site.yml")
    up.add_argument("--check", action="store_true", help="converge in check mode (with --diff)")
    up.add_argument(
        "--hosts",
        type=int,
        choices=(1, 2),
        default=1,
        help="Proxmox hosts of one cluster, each with its container and VM (2: the inventory's second host)",
    )
    conv = sub.add_parser("converge", help="converge site.yml against the running lab")
    conv.add_argument("--check", action="store_true", help="check mode (with --diff): show, change nothing")
    sub.add_parser("deploy", help="the README's deployment order, each playbook alone with a cold fact cache")
    ssh = sub.add_parser("ssh", help="a shell or a command on a lab machine, over the inventory's SSH road")
    ssh.add_argument("host")
    ssh.add_argument("argv", nargs="*", metavar="command")
    sub.add_parser("status", help="show what runs")
    sub.add_parser("down", help="remove the lab")
    args = parser.parse_args(argv)
    handler = {
        "up": cmd_up,
        "converge": cmd_converge,
        "deploy": cmd_deploy,
        "ssh": cmd_ssh,
        "status": cmd_status,
        "down": cmd_down,
    }[args.command]
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "containers.conf"))
    try:
        return handler(args)
    except LabError as exc:
        print(f"inferhost-lab: {exc}", file=sys.stderr)
        return 1
