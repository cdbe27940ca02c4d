"""Test bed shared by the functional tests and the demo: a Kubernetes API stand-in, test hosts, a runtime emulator."""  # noqa: E501
