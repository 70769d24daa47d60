"""python -m lit_transformer.bench NAME ...: the same as `python -m lit_transformer bench NAME ...` (a mistake answered
in a few lines, as the program answers it)."""

import sys

from lit_transformer.cli.program import main

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]])
