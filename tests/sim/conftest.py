import os


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/*.txt from the current generators (also: ENTRAIN_UPDATE_GOLDEN=1)",
    )


def update_golden(config) -> bool:
    try:
        flag = config.getoption("--update-golden")
    except ValueError:  # option not registered (this conftest was not an initial one)
        flag = False
    return bool(flag) or os.environ.get("ENTRAIN_UPDATE_GOLDEN") == "1"
