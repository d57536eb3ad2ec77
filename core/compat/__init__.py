"""Other spellings of acc: Accelerate's (its `accelerate launch` flags, its config files, its plugin objects, the
names `acc migrate` checks a script for) and acc's own earlier ones (module paths of the version-1 backend SDK), each
read with its meaning and handed to the kernel in acc's terms; and the lazy names by which the public faces (`acc`,
`acc.utils`, `acc.backend`, ...) hand on objects that live in the role packages.

Torch-free. Imports `acc.contract` and `acc.errors` only (a lazy name imports its target when first touched).
"""
