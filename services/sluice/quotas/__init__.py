"""Client quotas (docs/quotas.md): byte, request and subscribe rates per principal or client id.

- ``model``: the entities, limits and the snapshot a service decides from, and their protobuf forms;
- ``throttle``: the per-key rate accounting (GCRA) and KIP-219's throttle (``QuotaManager``);
- ``gate``: the wire connections' hold on a throttled principal's frames;
- ``follow``: the fetch quota on a followed (continuous) fetch's rounds;
- ``broker_hooks``: what a broker request counts (bytes, one request);
- ``client_id``: the client id a gRPC call announces (``sluice-client-id``);
- ``poller``: a broker's or dispatcher's long poll of the coordinator's quotas.
"""
