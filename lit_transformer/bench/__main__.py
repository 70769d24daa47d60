"""python -m lit_transformer.bench NAME ...: the same as `python -m lit_transformer bench NAME ...`."""

from lit_transformer.bench import main

if __name__ == "__main__":
    main()
