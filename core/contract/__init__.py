"""The contract between acc's kernel and its plugins: the hook specs and the data that crosses them.

Holds the hook specifications (`hookspecs`, versioned by `HOOKSPEC_VERSION`), what a backend promises
(`capabilities`), the collectives protocol (`communicator`), the per-run context handed to worker-side hooks
(`context`), settings as declared and resolved (`settings`), a launch plan (`launch_plan`), a scheduler's view of a
launch (`cluster`), a backend's answer to detection (`detection`), the enumerations and kwargs handlers scripts
name (`enums`, `kwargs`), the interface of a sharded build (`sharded_build`) and acc's version (`version`).

Torch-free, and the lowest layer: it imports only the standard library, pluggy and `acc.errors`. Plugins reach it
through the public SDKs (`acc.backend`, `acc.assembly.clusters`, `acc.tracking`), never by this path.
"""
