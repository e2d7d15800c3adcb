"""Security: TLS, authentication, ACL authorization, auditing (docs/security.md).

The pieces, each in its own module:

- ``model``: the vocabulary every piece shares (principals, resources, operations);
- ``settings``: the security settings every service takes (flags, env, TOML), one mixin;
- ``client``: what a client (the SDK, or a service calling another) presents: TLS and a token source;
- ``acl``: ACL entries, the indexed ``AclSet`` and the ``AclAuthorizer`` (a check is a dict lookup);
- ``acl_proto``: entries and filters to and from ``sluice.v1.acl`` messages;
- ``watcher``: ``SecurityWatcher``, a service's long poll of the coordinator's security snapshots;
- ``audit``: the audit log lines and the denial counter.
- ``scram``: SCRAM-SHA-256 credentials (computed by the client, stored by the coordinator);
- ``scram_login``: the SDK's token source for a user name and password (``ScramLogin``);
- ``session_tokens``: the tokens a login returns, verified in microseconds by every service;
- ``rate_limit``: the failed-login limiter (per address and per user).
"""
