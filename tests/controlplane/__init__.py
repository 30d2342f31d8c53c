"""The controlplane tier (a package so that its control plane fixture can be
package-scoped: see conftest.py)."""
