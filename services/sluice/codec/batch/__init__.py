"""The record batch: the one format records travel and rest in.

A producer encodes a batch once; the partition leader validates it, stamps the base
offset, the append time and its leader epoch into the header (fields outside the CRC), and
writes it to the log as it is; a follower copies it byte for byte and verifies the same CRC.
Consumers decode it. Nobody re-encodes per record, except the broker when a tag filter keeps
only part of a batch.

Layout, format version 2 (little-endian, no padding; docs/replication.md)::

    offset  size  field
    0       8     base_offset             stamped by the leader
    8       4     batch_length            whole batch, header included
    12      8     append_time_ms          stamped by the leader (-1 before)
    20      4     partition_leader_epoch  stamped by the leader (-1 before)
    24      1     magic                   = 2 (at byte 24 in every version)
    25      4     crc                     CRC32C of bytes [29, batch_length)
    29      1     attributes              bits 0-2: codec (``compression``), bits 3-7: 0
    30      8     producer_id             -1: not idempotent
    38      2     producer_epoch          -1: not idempotent
    40      4     base_sequence           -1: not idempotent
    44      4     record_count            > 0
    48      4     last_offset_delta       record_count - 1 unless filtered
    52      8     base_timestamp          ms
    60      8     max_timestamp           ms
    68      4     tag_table_length        bytes
    72            tag table          u16 count, then per tag u16 length + UTF-8
                  columns            record_count entries each, in this order:
                                     offset_delta i32, timestamp_delta i64,
                                     key_length i32 (-1: no key), value_length i32,
                                     headers_length i32, tag_index u16 (0xFFFF: none)
                  data               every key, then every value, then every headers blob

Format version 1 (magic 1) had a 54-byte header without the leader epoch and producer fields;
``v1`` converts it (a broker upgrading its data directory), and a produced one is refused.

The tag table lists every distinct tag in the batch, so a filtered fetch can skip a
whole batch from its header alone. The per-record fields are stored as columns so
that validation and decoding read each one with a single C-level cast instead of a
struct call per record, and the data is stored by column too (all keys, then all
values, then all headers), so a batch's values are one contiguous run: an Arrow
binary column is a zero-copy view of it (sluice.spark). A record's headers are u16 count, then per header u16
name length, name, u32 value length, value.

A compressed batch (codec != 0) keeps the header and tag table as they are and holds, after the tag
table, a u32 inflated length and the codec's frame of the columns and data (``compression``; readers
inflate it to the plain batch it stands for, ``plain_batch``).

The package is split along the batch's life: ``layout`` (the format itself and the CRC), ``build``
(the producer's encoder), ``validate`` (the broker's checks), ``records`` (the consumer's decoder) and
``view`` (the broker's tag filter and the dispatcher's per-consumer cuts). Import from the package.
"""

from sluice.codec.batch.build import BatchBuilder, encode_records
from sluice.codec.batch.layout import (
    APPEND_TIME_AT,
    COLUMN_BYTES,
    CRC_AT,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_AT,
    LEADER_EPOCH_AT,
    MAGIC,
    MAGIC_AT,
    MAX_RECORDS_PER_BATCH,
    NO_EPOCH,
    NO_KEY,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TAG,
    BatchHeader,
    Columns,
    Headers,
    check_magic,
    columns,
    crc32c,
    decode_headers,
    dense_offset_deltas,
    encode_headers,
    iter_headers,
    read_header,
    read_tags,
    restamp_producer,
    stamp,
)
from sluice.codec.batch.records import Record, RecordColumns, decode_columns, decode_records
from sluice.codec.batch.validate import DEFAULT_HEADER_LIMITS, HeaderLimits, validate_batch
from sluice.codec.batch.view import BatchView, batch_tags, batch_views, filter_batch

__all__ = [
    "APPEND_TIME_AT",
    "COLUMN_BYTES",
    "CRC_AT",
    "CRC_START",
    "DEFAULT_HEADER_LIMITS",
    "HEADER",
    "HEADER_SIZE",
    "LAST_OFFSET_DELTA_AT",
    "LEADER_EPOCH_AT",
    "MAGIC",
    "MAGIC_AT",
    "MAX_RECORDS_PER_BATCH",
    "NO_EPOCH",
    "NO_KEY",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NO_TAG",
    "BatchBuilder",
    "BatchHeader",
    "BatchView",
    "Columns",
    "HeaderLimits",
    "Headers",
    "Record",
    "RecordColumns",
    "batch_tags",
    "batch_views",
    "check_magic",
    "columns",
    "crc32c",
    "decode_columns",
    "decode_headers",
    "decode_records",
    "dense_offset_deltas",
    "encode_headers",
    "encode_records",
    "filter_batch",
    "iter_headers",
    "read_header",
    "read_tags",
    "restamp_producer",
    "stamp",
    "validate_batch",
]
