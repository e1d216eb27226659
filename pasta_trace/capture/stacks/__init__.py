"""The capture's side of stacks: registering Python processes with the BPF walker and reading their code
objects (stack_collector), and draining the copied user stacks of --native-stacks (native_collector).
Unwinding and symbolizing live in pasta_trace.stacks."""
