/* main.c - the tandem command: dispatches to the command layer of each module. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        printf("usage: tandem <command> [options]\n");
        return argc < 2 ? 2 : 0;
    }
    fprintf(stderr, "tandem: unknown command '%s'\n", argv[1]);
    return 2;
}
