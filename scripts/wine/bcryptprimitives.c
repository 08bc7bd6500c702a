/* For the wine smoke of scripts/cross-build only; never bundled or shipped.
 *
 * Rust's standard library (1.78 and later) takes its randomness on Windows
 * from ProcessPrng in bcryptprimitives.dll, which every supported Windows
 * has but Debian 12's wine 8.0 does not (wine added it in 9.x). Placed
 * beside skill-lock.exe for that run only, this DLL provides ProcessPrng
 * from wine's own RtlGenRandom (advapi32 SystemFunction036): real
 * randomness from the host, no other behaviour. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length) {
    while (length > 0) {
        ULONG n = length > 0x10000000 ? 0x10000000 : (ULONG)length;
        if (!SystemFunction036(data, n)) return FALSE;
        data += n;
        length -= n;
    }
    return TRUE;
}
