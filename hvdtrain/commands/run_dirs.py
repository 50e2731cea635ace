"""What eval and predict share: the run directory's saved config."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hvdtrain import config as config_lib
from hvdtrain.config import overrides
from hvdtrain.errors import UserError


def saved_config(args: argparse.Namespace) -> config_lib.Config:
    """eval and predict: the config.json of ``args.run_dir``, with eval's --set on top."""
    saved = Path(args.run_dir) / "config.json"
    if not Path(args.run_dir).is_dir():
        raise UserError(f"run dir {args.run_dir} does not exist: pass the --run-dir of a "
                        f"training run")
    try:
        values = json.loads(saved.read_text())
    except FileNotFoundError:
        raise UserError(f"{saved} not found: is {args.run_dir} a run directory?") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {saved}: {e}") from None
    base = overrides.from_dict(values)
    return overrides.with_overrides(
        base, overrides.parse_assignments(getattr(args, "assignments", [])))
