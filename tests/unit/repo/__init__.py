"""The repository's own checks, not gpudra's behaviour: docs, examples, chart, image, protos, layering, and
the test tooling."""
