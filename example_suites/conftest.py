"""Run metadata of the example suites. The hook lives here, not in custom_ps/conftest.py:
pytest loads this file before collection (it is the conftest of the directory the run is
given), so the metadata is recorded however early the plugin wakes (the docs' "Hooks")."""


def pytest_tfgrpc_run_metadata(config):
    return {"my_ps": "example-1.0"}  # e.g. the commit under test: checked by the gate
