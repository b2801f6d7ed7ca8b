-- tenants and namespaces.
CREATE TABLE tenants (
    name TEXT PRIMARY KEY,
    info TEXT NOT NULL
);
CREATE TABLE namespaces (
    name TEXT PRIMARY KEY,
    tenant TEXT NOT NULL
);
