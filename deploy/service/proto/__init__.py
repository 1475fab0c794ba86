"""gRPC service definition (specfleet.proto) and its Python stubs, generated at install.

`make install` runs `python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=.
deploy/service/proto/specfleet.proto`, writing `specfleet_pb2.py` and `specfleet_pb2_grpc.py` here
(gitignored, never hand-edited). Only the gRPC front (deploy/service/grpc_api.py) and clients import them.
"""
