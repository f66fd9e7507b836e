"""The four kinds of JSON-RPC message, as ``decode_message`` and ``salvage_envelope`` name
them. Sans-IO."""

REQUEST = 1
NOTIFICATION = 2
RESPONSE = 3
ERROR = 4
