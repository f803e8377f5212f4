/*
 * Replays a fuzz target's committed corpus without libFuzzer: every file under
 * tests/fuzz/corpus/<target>/ and tests/regress/<target>/ is fed to LLVMFuzzerTestOneInput.
 * <target> is this program's name without the "replay_" prefix.  Run from the repository root.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
        size_t got = len > 0 ? fread(buf, 1, (size_t)len, f) : 0;
        fclose(f);
        LLVMFuzzerTestOneInput(buf, got);
        free(buf);
        n++;
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    (void)argc;
    const char *name = strrchr(argv[0], '/');
    name = name ? name + 1 : argv[0];
    if (strncmp(name, "replay_", 7) == 0)
        name += 7;
    char dir[1024];
    snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", name);
    int n = replay_dir(dir);
    snprintf(dir, sizeof dir, "tests/regress/%s", name);
    n += replay_dir(dir);
    if (n == 0) {
        fprintf(stderr, "replay %s: no corpus files found (run from the repository root)\n", name);
        return 1;
    }
    printf("replay %s: %d inputs, no crash\n", name, n);
    return 0;
}
