-- the actions granted to a role on a scope, comma-separated, sorted.
CREATE TABLE permissions (
    scope TEXT NOT NULL,
    role TEXT NOT NULL,
    actions TEXT NOT NULL,
    PRIMARY KEY (scope, role)
);
