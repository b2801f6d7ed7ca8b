"""Authentication, authorization and TLS, as Pulsar does them (issue 15).

* ``tokens`` — JWT keys and tokens (Pulsar's token provider; PyJWT does the crypto).
* ``api.broker.access`` (in the broker core, which both doors share) — ``AccessControl``:
  who a client is (token or TLS client certificate) and what that role may do
  (super-users, produce/consume grants of ``api.broker.grants``, persisted on the
  metadata database as component ``permissions``).
* ``rest`` — the admin-port middleware: Host allow-list, Bearer authentication, admin
  authorization, applied to every route.
* The Pulsar port's admission (CONNECT authentication) is the wire's own:
  ``api.wire.auth``, beside the connections that call it.
* ``tls`` — the server SSL contexts of both TLS ports; the start-up check of the files.
* ``tokens_cli`` — ``compactd tokens``.
"""
