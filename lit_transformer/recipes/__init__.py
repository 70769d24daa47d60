"""Recipes built on the engine and the command line, each a command of the program: `ablate` (a grid of variants over
seeds), `translation-recipe` (the paper's checkpoint averaging and EMA, scored) and `digit-strips` (the captioning
task's images as PNGs)."""
