"""The CLI (gpudra.cli) as a user runs it: inventory, explain, migrate, validate, bad input."""
