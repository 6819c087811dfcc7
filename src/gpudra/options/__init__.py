"""The daemons' options: their value types (`types`)."""
