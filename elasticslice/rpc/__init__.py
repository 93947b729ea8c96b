"""ProtoGENI XML-RPC over TLS: response codes, transport, the SA/CM client, credentials."""
