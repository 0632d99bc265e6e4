import interlock.transfer as t


def test_public_api_is_pinned():
    assert sorted(t.__all__) == [
        "BlockExport",
        "BlockImport",
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
        "publish_blocks",
        "stage_blocks",
    ]
