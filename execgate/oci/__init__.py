"""runc's command line, bundles and process specs: what execgate reads of the OCI contract."""
