"""The hardware "dialect": what this machine is and what it can really do."""
