"""Prepared data loaders: each process gets its share of every epoch, on its device.

`loader` is the prepared loader (`PreparedDataLoader`, `skip_first_batches`, the loader's resumable position),
`samplers` how batches are shared among processes (the samplers and dataset wrappers under `prepare`), and
`tensor_rows` the whole-batch reads of an in-memory `TensorDataset`. Accelerate's names for them are
`acc.data_loader`.

Part of the runtime: imports `acc.runtime.ops`, the contract and torch.
"""
