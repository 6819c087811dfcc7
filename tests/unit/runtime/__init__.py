"""What every daemon runs on (gpudra.runtime, gpudra.atomic_file, gpudra.build): services, the HTTP
endpoint, metrics, logs, the version."""
