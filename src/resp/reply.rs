//! Builders for replies the proxy writes itself.
