"""What writes the documentation's generated parts: docs/config.md from the code (docgen.py) and the README's figure
from its JSON (plots.py)."""
