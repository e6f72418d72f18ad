"""Senders: the few long-lived processes that talk to the TEI servers for a whole run.

Why they exist: a server's ``max_concurrent_requests`` is one budget, counted in inputs across
every client. Split up front between shard tasks, each slice sits idle while its task reads,
hashes or writes Parquet, and slices smaller than a batch shrink every request. So every server
is owned by exactly one sender for the whole run, which holds its *whole* budget and one adaptive
window (``tei/pool.py``); shard tasks stream their texts to the senders in chunks and get the
vectors back through Ray's object store. Whatever is sending right now uses the whole budget, the
last shard of a run included, and a task that is reading or writing holds none of it.

The modules, by role (``plans`` is imported by the other two sides, which do not import each other):

* ``plans``: what a sender is given (its servers and their limits), how servers are split between
  senders, and which sender takes a chunk next. Plain records: the driver, the shard tasks and the
  senders' processes all import them.
* ``core`` and ``actor``: the sender itself, its work on one event loop (:class:`~.core.SenderCore`,
  plain Python) and the Ray actor hosting it (:class:`~.actor.SenderActor`), with the driver's calls
  that start, ask and stop the actors.
* ``sending``: the shard task's side: texts streamed out in chunks, results back in text order.

How the pieces meet:

* How many senders: one per ``SERVERS_PER_SENDER`` servers (servers, not CPUs, size them); each
  is an asyncio actor with ``num_cpus=0`` placed on the driver's node (where SSH tunnels end).
* What a chunk is: ``CHUNK_BUDGETS`` times its sender's budget in texts, fewer where their vectors
  would pass ``CHUNK_VECTOR_BYTES``, never fewer than ``CHUNK_BATCHES`` full requests' worth, so
  sharing never shrinks a request (only the last chunk of a shard may end in a smaller one) and the
  fixed cost of each chunk (a Ray call each way, objects in Ray's store) spreads over many texts.
* Inside a sender, chunks are admitted oldest shard task first (``pipeline/admission.py``); enough
  of them at once to fill every server's window, and no more, so a chunk's requests go out together
  and it comes back soon, and tasks finish one after another instead of all at once. A chunk whose
  texts are all out lets the next one in while it waits for its answers.
* At the end of a run, idle servers take copies of the requests that would land last (tail
  hedging, ``tei/hedging.py``). A sender allows it once it knows no more texts will come: the driver
  names the shards still running when it has started the last task (``SenderActor.last_streams``),
  and each shard says when it has sent its last chunk (``SenderActor.stream_done``; the driver
  says it for a task that ended without doing so).
* Every request of a run is a sender's. The senders get their plans once the servers' ``/info``
  is read, and are told the servers' vector size after the probe (``SenderActor.probed``): chunks
  sent before that wait in the sender.
* A sender that dies (its process, or its node) is restarted by Ray with fresh, full windows; the
  chunks it held fail in the shard task, which sends them again (bounded). A shard task that dies
  leaves nothing counted anywhere: in-flight counts live only inside the sender that sends. A
  restarted sender does not know which shards are done, and never copies requests; the requests
  its predecessor left in the servers' queues are no longer counted in it.

This package re-exports nothing: import from the module that owns a name.
"""
