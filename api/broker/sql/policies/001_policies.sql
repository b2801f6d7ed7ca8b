-- policy values per scope.
CREATE TABLE policies (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (scope, name)
);
