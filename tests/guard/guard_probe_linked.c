// Calls cuMulticastCreate bound at link time (-lfakecuda), the path symbol interposition covers.
#include <stdio.h>

int cuMulticastCreate(unsigned long long* handle, const void* prop);

int main(void) {
  unsigned long long handle = 0;
  int result = cuMulticastCreate(&handle, NULL);
  printf("cuMulticastCreate returned %d\n", result);
  return result;
}
