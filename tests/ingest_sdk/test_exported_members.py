"""The public surface of ingest_sdk is exactly what __all__ lists."""

import ingest_sdk


def test_all_names_exist_and_are_public():
    exported = set(ingest_sdk.__all__)
    assert len(exported) == len(ingest_sdk.__all__), "duplicate names in __all__"
    for name in exported:
        assert hasattr(ingest_sdk, name), name


def test_every_public_attribute_is_listed():
    public = {
        name
        for name, value in vars(ingest_sdk).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("ingest_sdk")
    }
    assert public <= set(ingest_sdk.__all__), public - set(ingest_sdk.__all__)
