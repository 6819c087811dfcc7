"""The pure core: the config API (gpudra.api), the device model and claims (gpudra.model), quantities,
bounded JSON."""
