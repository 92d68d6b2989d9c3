"""The team's own parameter server, the code under test: Push stores a named tensor, Pull
returns it, Echo sends the request back. ``python my_ps.py ADDRESS`` serves on ADDRESS (an
ephemeral port, printed) until its stdin closes."""

import sys
from concurrent import futures

import grpc

UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def main(address: str) -> None:
    store: dict[bytes, bytes] = {}

    def push(request: bytes, context: grpc.ServicerContext) -> bytes:
        name, _, data = request.partition(b"\0")
        store[name] = data
        return b""

    methods = {
        "Push": push,
        "Pull": lambda request, context: store[request],
        "Echo": lambda request, context: request,
    }
    handlers = {name: grpc.unary_unary_rpc_method_handler(f) for name, f in methods.items()}
    server = grpc.server(futures.ThreadPoolExecutor(4), options=UNLIMITED)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("myps.PS", handlers)])
    port = server.add_insecure_port(f"[{address}]:0" if ":" in address else f"{address}:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()  # the parent closes our stdin to stop us
    server.stop(0)


if __name__ == "__main__":
    main(sys.argv[1])
