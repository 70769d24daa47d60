from lit_transformer.cli.program import main

if __name__ == "__main__":
    main()
