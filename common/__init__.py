"""What every layer of omnijax shares: errors, config readers, weight records, parameter and layer primitives
with logical axis names, and the mesh helper. Imports nothing else of omnijax."""
