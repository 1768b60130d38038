/* Linked with early_lib.c, whose constructor does all the work before main. */
int early_value(void);

int main(void)
{
	return early_value() > 1;
}
