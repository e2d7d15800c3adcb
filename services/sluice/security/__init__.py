"""Security: TLS, authentication, ACL authorization, auditing (docs/security.md).

The pieces, each in its own module:

- ``model``: the vocabulary every piece shares (principals, resources, operations);
- ``settings``: the security settings every service takes (flags, env, TOML), one mixin;
- ``client``: what a client (the SDK, or a service calling another) presents: TLS and a token source.
"""
