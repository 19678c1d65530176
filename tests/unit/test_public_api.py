import twinserve


def test_all_lists_exactly_the_public_names() -> None:
    public = {name for name in dir(twinserve) if not name.startswith("_")}
    modules = {
        "config",
        "errors",
        "model",
        "core",
        "fronts",
        "service",
        "protocol",
        "servers",
        "examples",
        "cli",
        "observability",
        "lab",
        "deploy",
        "cli_args",
        "loading",
        "extras",
        "encoding",
        "repository",
        "settings_file",
        "api_keys",
        "secret_settings",
        "setting_types",
    }
    assert set(twinserve.__all__) - {"__version__"} == public - modules
