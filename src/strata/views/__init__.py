"""Rich renderings of results for the terminal (the CLI stays thin)."""
