//! ferry-openapi
