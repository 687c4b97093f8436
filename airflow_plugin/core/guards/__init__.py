"""The two checks every restore and start makes before a query runs, side by side:

source.py   the snapshot's source positions against what the broker still holds: a restore that would skip
            records is refused, or its accepted gap recorded (and snapshots that can no longer restore marked)
sink.py     the sink's position against the batch the query starts after: a start onto a sink that already
            holds later batches is refused (those batches would be skipped), or the sink rewound first"""
