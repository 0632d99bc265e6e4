import interlock.transfer as t


def test_public_api_is_pinned():
    assert sorted(t.__all__) == [
        "DEFAULT_TIMEOUT_S",
        "DestTransfer",
        "LinkStats",
        "SourceTransfer",
        "TRANSPORTS",
        "TransferAgent",
        "TransferDescriptor",
        "TransferState",
        "TransferStatus",
        "import_when_done",
        "measure_link",
        "stage_blocks",
    ]
