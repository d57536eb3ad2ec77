"""Pipeline-parallel inference (Accelerate's `accelerate.inference.prepare_pippy`, checked by Accelerate's
test_utils/scripts/external_deps/test_pippy.py on GPT-2 and BERT): acc does not have it.

    acc launch --backend ddp --nproc 2 PATH/test_pippy.py

acc has no `acc.inference` module and no `prepare_pippy`, so there is nothing here to check: the script says so and
exits with status 2 (never 0: it checked nothing). `require_pippy` (acc.test_utils.testing) skips the tests that
would launch it for the same reason.
"""

from __future__ import annotations

import importlib.util
import sys

MESSAGE = ("test_pippy: nothing checked: acc has no pipeline-parallel inference (Accelerate's "
           "accelerate.inference.prepare_pippy; acc.inference does not exist)")


def main() -> int:
    if importlib.util.find_spec("acc.inference") is None:
        print(MESSAGE, file=sys.stderr)
        return 2
    print("test_pippy: acc.inference exists now: write this script's checks (prepare_pippy on GPT-2 and BERT: "
          "the output only on the last process)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
