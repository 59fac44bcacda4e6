/* A shared library without the kvcheck entry symbol: loading it must fail with a clear message. */
int kvcheck_not_the_entry(void);
int kvcheck_not_the_entry(void) { return 42; }
