"""Events from the rings to the capture directory: the drain loop, the shared ring and queue to the events
writer process (shared_ring, writer_queue, event_writer, with heap keeping its freed memory), decoding records
into frames (decode, with the NCCL and tensor state carried between batches: collectives, tensor_sizes), the
Parquet writer, the manifest, the ledger and the takeover of a dead tracer's ring."""
