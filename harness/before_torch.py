"""`python train.py`: its flags read before train.py imports torch, so --help and a bad flag answer at once.

train.py imports this module first. When train.py is the script being run, `command_line` is its Config (loaded
once, --resume's saved settings included); when anything else imports train.py, None.
"""
import os
import sys

from harness import flags


def running_train_py():
    """True while train.py is the script that Python runs (python train.py, or runpy with run_name "__main__")."""
    return os.path.basename(getattr(sys.modules.get("__main__"), "__file__", None) or "") == "train.py"


command_line = flags.load() if running_train_py() else None
